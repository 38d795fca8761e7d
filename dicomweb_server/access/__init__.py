"""Who sees what: study labels and the access rules that map an identity to the labels
it may see (docs/notes/access-labels.md). Both front doors (api/, dimse/) use it; it
imports neither, nor the store (the store imports :mod:`.filter`)."""
