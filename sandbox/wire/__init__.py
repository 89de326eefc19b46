"""What the service and a worker say to each other: framing, frames, answers and the limits both enforce.

Standard library only: this runs inside the sandbox image."""
