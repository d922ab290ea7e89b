"""Files posfair writes and reads: atomic writes (:mod:`~posfair.files.atomic`), the checked reading of what a user
gives (:mod:`~posfair.files.reading`) and output folders that say what is in them
(:mod:`~posfair.files.run_folder`).  Each module is imported by its own name; the package exports nothing itself."""
