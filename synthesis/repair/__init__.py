"""Repairing what failed: tools the checker labelled fail, scenarios whose replay failed, environments blamed by them."""
