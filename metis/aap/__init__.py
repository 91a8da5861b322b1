"""The Agent Application Protocol façade (v3 at `/aap`, v1 at `/aap/v1`) over the metis core."""
