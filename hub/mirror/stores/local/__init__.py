"""The folder kind of mirror store: a local folder in the stock cache layout.

Its import, read, check records, scrub and pull-through live here.
"""
