"""Google Gemini's embedding API, for google-genai pointed at this server."""
