"""Where sessions live: the store contract, the in-process store and the Redis store."""
