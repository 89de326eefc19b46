"""The sandbox worker: what runs inside a worker process or container. Standard library only."""
