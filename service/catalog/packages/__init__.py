"""Third-party packages environments declare: installed once per allowed set, read-only."""
