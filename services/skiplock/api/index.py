"""GET /v1/: what this server is and where its collections are, so that the URL `skiplock dev`
prints answers something useful; GET / redirects to the web console (/ui/).
Public, like the OpenAPI document: it tells nothing a client could not read there, and reads no
database. The links come from the app's URL map, so a new collection shows up by itself.
"""

from __future__ import annotations

from flask import Blueprint, Response, current_app

from ..engine.version import package_version
from .console import PREFIX as CONSOLE
from .openapi import VERSION as API_VERSION
from .operations import operation
from .responses import json_response
from .schema import JsonObject, Object, String

bp = Blueprint("index", __name__)

PREFIX = "/v1/"

INDEX = Object({
    "name": String(example="skiplock"),
    "version": String("The server's package version.", example="0.1.0"),
    "api_version": String(example=API_VERSION),
    "openapi": String("Path of the OpenAPI 3 document of every route.", example="/v1/openapi.json"),
    "links": JsonObject("Path of each collection a GET lists, by name: tasks, queues, schedules, ..."),
}, "Where to start.", required=("name", "version", "api_version", "openapi", "links"))


@operation(bp, "GET", "/", summary="Redirect to the web console, /ui/", role=None, tag="health",
           responses={302: ("Location: /ui/.", None)})
def root():
    return Response(status=302, headers={"Location": f"{CONSOLE}/"})


@operation(bp, "GET", PREFIX, summary="What this server is and where its collections are", role=None,
           tag="health", responses={200: ("The index.", INDEX)})
def index():
    links = {}
    for rule in current_app.url_map.iter_rules():
        path = rule.rule
        # top-level collections only: /v1/queues, not /v1/queues/throughput
        if "GET" in rule.methods and path.startswith(PREFIX) and path != PREFIX and "<" not in path \
                and "/" not in path[len(PREFIX):]:
            links[path[len(PREFIX):].split(".")[0]] = path
    openapi = links.pop("openapi")
    return json_response({"name": "skiplock", "version": package_version(), "api_version": API_VERSION,
                          "openapi": openapi, "links": dict(sorted(links.items()))})
