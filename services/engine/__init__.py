"""The engine: each task's classifier kept level with its spec, its example log and its served version.

What a replica serves with, apart from HTTP (services/api) and from the Redis transport (services/bus).
"""
