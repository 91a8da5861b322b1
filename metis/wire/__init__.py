"""The REST API's JSON read for a person: pure functions over the shapes the daemon returns
(messages, tool calls, events), shared by its clients (the terminal app, `metis chat`,
`metis run`) and by the daemon's session export, so a tool call or a transcript reads the same
wherever it is shown."""
