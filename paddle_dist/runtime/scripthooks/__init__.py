"""What `python -m paddle_dist.launch` adds to a plain script's ranks without changing the
script or its command line: pythonpath/ (holding only sitecustomize.py) is put first on
their PYTHONPATH (protocol.script_hooks), and its sitecustomize hooks paddle.DataParallel
once the script imports paddle (an import run with the garbage collector paused:
runtime/paddle_import.py); tables.py then refuses, in one line, a sparse table Paddle's
reducer would die on (SIGSEGV), and buffers.py gives each DataParallel --sync-buffers, or
warns that the ranks' BatchNorm statistics differ.

This face imports nothing (the sitecustomize imports `buffers` when a DataParallel is made).
"""
