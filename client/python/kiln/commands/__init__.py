"""What `python -m kiln` runs (kiln/__main__.py parses the command line):
status, misses, prewarm and service. The top of the client's rooms: each
command may use any other room."""
