"""flash-cann inside other libraries' attention plug-in points (imported on request:
each module imports the library it plugs into)."""
