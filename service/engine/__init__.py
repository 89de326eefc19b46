"""The session engine: create, call, observe, score, fork and rewind sessions; episodes in turns."""
