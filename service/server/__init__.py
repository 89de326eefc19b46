"""The server: the application factory, connection and body limits, and the process's own memory."""
