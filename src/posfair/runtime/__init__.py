"""How posfair behaves as a Python library, whatever it computes: its exceptions (:mod:`~posfair.runtime.errors`),
progress of long calls (:mod:`~posfair.runtime.progress`), the caller's line its warnings point at
(:mod:`~posfair.runtime.stacklevel`), the lazy exports of every package (:mod:`~posfair.runtime.lazy`) and the
hooks that run when transformers' modules are imported (:mod:`~posfair.runtime.post_import`).  Each module is
imported by its own name; the package exports nothing itself (every package's ``__init__`` imports
:mod:`~posfair.runtime.lazy`, so this one stays empty)."""
