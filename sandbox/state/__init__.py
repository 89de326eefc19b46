"""State as the service and the worker see it: the encoder and decoder, the JSON view, parts and deltas, and the
proofs of which tools change nothing. Standard library only: this runs inside the sandbox image."""
