"""Use cases: what the CLI, the daemon and the HTTP API call. (Started with ``judge``; the rest moves here.)"""
