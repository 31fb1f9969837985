"""cmh.hub: mirror store and server, resolver, pruning (imported as ``cmh.hub``)."""
