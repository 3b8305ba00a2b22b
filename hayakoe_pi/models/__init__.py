"""The model side: HayaKoe-layout model files → ONNX Runtime sessions, and what is
derived from them once (the split decoder, its forms, optimized copies, timings).

A module a job; ARCHITECTURE.md's table lists them, each importing only those
below it (tests/test_imports.py checks), with the path from files to sessions.
The entry point is store.ModelStore.
"""
