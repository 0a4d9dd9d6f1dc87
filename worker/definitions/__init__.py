"""Tool definitions: the model, templates, transforms, one reader per format, the stores, the catalog."""
