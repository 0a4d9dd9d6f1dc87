"""One tool call to one envelope: admission, attempts and retries, shaping; a handler per tool kind."""
