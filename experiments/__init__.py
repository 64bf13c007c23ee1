"""Experiments: the sweep runner (``python -m experiments``) and its configs."""
