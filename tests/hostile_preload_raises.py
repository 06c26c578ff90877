raise RuntimeError("preload module raised at import")
