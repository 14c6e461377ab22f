// Swagger UI on this server's OpenAPI document. A file of its own, not an inline script: the
// docs pages' Content-Security-Policy allows scripts from this server only.
"use strict";
window.addEventListener("DOMContentLoaded", () => {
  window.ui = SwaggerUIBundle({
    url: "openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
  });
});
