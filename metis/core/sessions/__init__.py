"""Sessions: creation, listing, ending and purging; the in-memory cache of the sessions this
process serves; project instructions read from a session's workspace.
"""
