"""One module per wire API. Each is imported only when a model on it is used."""
