"""Confining the worker and its forks: privileges, seccomp, Landlock. Standard library only."""
