"""The HTTP surface: endpoints, the server and its connections, the web configuration, and the
collectors a scrape renders."""
