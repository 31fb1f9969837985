"""The bucket kind of mirror store: an S3-compatible bucket.

Its layout, import, read, send, scrub and pull-through live here.
"""
