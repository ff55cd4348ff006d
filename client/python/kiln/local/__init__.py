"""What this process keeps and does on its own machine: Kiln's files (files),
the local indexes that serve entries without a call to kilnd (index), and the
threads that compile kernels ahead of their first use, with what they saved
(compile_threads). Depends only on kiln.service."""
