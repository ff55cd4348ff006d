"""Imported by kiln-activate.pth at interpreter start when KILN or KILN_ENDPOINT
is set. Cheap and safe to run twice: it only sets environment variables;
Triton loads the rest on its first cache access."""

import kiln

kiln.activate_lazily()
