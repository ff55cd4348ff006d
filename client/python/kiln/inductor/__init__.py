"""Kiln inside torch.compile's inductor: kilnd as the store behind its remote
caches (caches), one compile per graph across processes (claims), no compile
workers for a process whose graphs all come from the cache (pool), a graph's
Triton kernels compiled at once in Kiln's threads (threads), and what stock
works out again in every process (memos). Uses the Triton room's parts."""
