// The API docs pages (/docs: Swagger UI, /redoc: ReDoc), scripts served by this server (no network).
// The schema is fetched with the API key the search page keeps in this tab (sessionStorage "apiKey").
"use strict";

function authHeaders() {
  const key = sessionStorage.getItem("apiKey");
  return key ? { Authorization: "Bearer " + key } : {};
}

async function openDocs(kind) {
  const keyRow = document.getElementById("key-row");
  document.getElementById("api-key").addEventListener("change", (e) => {
    sessionStorage.setItem("apiKey", e.target.value);
    location.reload();
  });
  if ((kind === "swagger" && typeof SwaggerUIBundle === "undefined") || (kind === "redoc" && typeof Redoc === "undefined")) {
    document.getElementById("missing").hidden = false;
    return;
  }
  const res = await fetch("/openapi.json", { headers: authHeaders() });
  if (res.status === 401) { keyRow.hidden = false; return; }
  const spec = await res.json();
  if (kind === "redoc") {
    Redoc.init(spec, {}, document.getElementById("redoc"));
    return;
  }
  SwaggerUIBundle({
    spec: spec, dom_id: "#swagger-ui", deepLinking: true,
    presets: [SwaggerUIBundle.presets.apis], layout: "BaseLayout",
    // requests made with "Try it out" carry the key too, unless one was given with Authorize
    requestInterceptor: (req) => {
      const h = authHeaders();
      if (h.Authorization && !req.headers.Authorization) req.headers.Authorization = h.Authorization;
      return req;
    },
  });
  document.body.dataset.ready = "1";
}
