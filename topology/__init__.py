"""Topology files (TOML): the model, loading and validation, and the local launcher
(`oncemesh up/status/down`) with its link proxies."""
