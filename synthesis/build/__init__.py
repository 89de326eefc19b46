"""Putting generated parts together: the environment class, scenario drafts, and static checks of initial states."""
