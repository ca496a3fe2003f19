"""How a client reaches a daemon: its URL and API key (connect.py), daemons on the LAN (discover.py).

The one layer clients/ (the CLI, `evenflow bench`) and tui/ (the monitor) share; it imports neither of them.
"""
