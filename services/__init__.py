"""Shells around the `openbook` library: the Redis bus, the HTTP api and the trainer worker."""
