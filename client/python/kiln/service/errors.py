class KilnUnavailable(RuntimeError):
    """kilnd cannot be reached and KILN_STRICT forbids compiling without it."""
