"""A small Kubernetes API server for helm, on loopback: discovery (/version, /api, /apis and
each group version, including the kinds that CRDs created through it define), generic CRUD of
any resource (create, get, list with label selectors, replace, delete), the patch types helm
sends (JSON merge, strategic merge, server-side apply) and Secrets for helm's release storage.
It keeps every object in memory and logs every request, so a test can see what helm did.

What it does not do, and so what tests must not claim from it: admission (no policies run),
schema validation, garbage collection beyond what deleting a CRD implies (its objects go, as
in a real API server), watches, and field ownership (server-side apply replaces the object
with what was applied: the semantics of one field manager).

Strategic merge patches are applied with the merge keys of the list fields Lace's charts use
(containers and volumes by name, volumeMounts by mountPath, ports by containerPort, ...) and
the patch directives client-go emits ($setElementOrder, $patch, $retainKeys,
$deleteFromPrimitiveList); every other list is replaced, which is that list's strategy in the
Kubernetes API unless it names a merge key.
"""

import base64
import copy
import datetime
import http.server
import itertools
import json
import threading
import urllib.parse
import uuid

import yaml

# (group, version, plural, kind, namespaced)
BUILTIN = [
    ("", "v1", "namespaces", "Namespace", False),
    ("", "v1", "nodes", "Node", False),
    ("", "v1", "secrets", "Secret", True),
    ("", "v1", "configmaps", "ConfigMap", True),
    ("", "v1", "serviceaccounts", "ServiceAccount", True),
    ("", "v1", "services", "Service", True),
    ("", "v1", "pods", "Pod", True),
    ("", "v1", "events", "Event", True),
    ("apps", "v1", "deployments", "Deployment", True),
    ("apps", "v1", "daemonsets", "DaemonSet", True),
    ("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    ("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    ("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    ("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    ("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False),
    ("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies",
     "ValidatingAdmissionPolicy", False),
    ("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings",
     "ValidatingAdmissionPolicyBinding", False),
    ("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True),
    ("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True),
    ("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False),
    ("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True),
]
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
MERGE_KEYS = {"containers": "name", "initContainers": "name", "ephemeralContainers": "name",
              "env": "name", "volumes": "name", "volumeMounts": "mountPath",
              "ports": "containerPort", "imagePullSecrets": "name", "volumeDevices": "devicePath"}
SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")


def _protobuf_fields(data):
    """(field number, value) of a protobuf message: ints for varints, bytes for the rest."""
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 2:
            size, i = _varint(data, i)
            value, i = data[i:i + size], i + size
        else:
            raise APIError(415, "UnsupportedMediaType", f"protobuf wire type {wire}")
        yield number, value


def _varint(data, i):
    shift = result = 0
    while True:
        b = data[i]
        i += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, i


def _pb_map(entries):
    out = {}
    for entry in entries:
        f = dict(_protobuf_fields(entry))
        out[f.get(1, b"").decode()] = f.get(2, b"")
    return out


def secret_from_protobuf(raw):
    """The Secret in a `k8s\\0`-prefixed runtime.Unknown: client-go's typed clientset (helm's
    release storage) writes Secrets as protobuf. Only the fields helm sets are decoded."""
    if raw[:4] != b"k8s\x00":
        raise APIError(415, "UnsupportedMediaType", "protobuf without the k8s envelope")
    unknown = dict(_protobuf_fields(raw[4:]))
    type_meta = dict(_protobuf_fields(unknown[1]))
    if type_meta.get(2) != b"Secret":
        raise APIError(415, "UnsupportedMediaType", f"protobuf {type_meta.get(2)!r}, not a Secret")
    meta, data, secret_type = {}, {}, None
    for number, value in _protobuf_fields(unknown[2]):
        if number == 1:
            fields = list(_protobuf_fields(value))
            plain = dict(fields)
            meta = {k: plain[n].decode() for k, n in (("name", 1), ("namespace", 3),
                                                        ("resourceVersion", 6)) if plain.get(n)}
            labels = {k: v.decode() for k, v in _pb_map(v for n, v in fields if n == 11).items()}
            if labels:
                meta["labels"] = labels
        elif number == 2:
            data.update(_pb_map([value]))
        elif number == 3:
            secret_type = value.decode()
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": meta,
              "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}
    if secret_type:
        secret["type"] = secret_type
    return secret


class APIError(Exception):
    def __init__(self, code, reason, message):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def json_merge(target, patch):
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = json_merge(result.get(k), v)
    return result


def strategic_merge(target, patch, field=None):
    if isinstance(patch, list):
        key = MERGE_KEYS.get(field)
        if not key or not all(isinstance(i, dict) for i in patch):
            return [i for i in copy.deepcopy(patch)
                    if not (isinstance(i, dict) and i.get("$patch") == "delete")]
        result = copy.deepcopy(target) if isinstance(target, list) else []
        for item in patch:
            at = next((i for i, t in enumerate(result) if t.get(key) == item.get(key)), None)
            if item.get("$patch") == "delete":
                if at is not None:
                    del result[at]
            elif at is None:
                result.append(strategic_merge(None, item))
            else:
                result[at] = strategic_merge(result[at], item)
        return result
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$deleteFromPrimitiveList/"):
            name = k.split("/", 1)[1]
            result[name] = [x for x in result.get(name, []) if x not in v]
        elif k.startswith("$") or k == "$patch":
            continue
        elif v is None:
            result.pop(k, None)
        else:
            result[k] = strategic_merge(result.get(k), v, k)
    for k, order in patch.items():
        if k.startswith("$setElementOrder/"):
            name = k.split("/", 1)[1]
            key = MERGE_KEYS.get(name)
            items = result.get(name, [])
            if key:
                rank = {o.get(key): i for i, o in enumerate(order)}
                items.sort(key=lambda i: rank.get(i.get(key), len(rank)))
            result[name] = items
    if "$retainKeys" in patch:
        result = {k: v for k, v in result.items() if k in patch["$retainKeys"]}
    return result


class FakeAPIServer:
    def __init__(self, version="1.33.0"):
        self.version = version
        self.lock = threading.Lock()
        self.resources = {}  # (group, version, plural) -> (kind, namespaced)
        for g, v, plural, kind, namespaced in BUILTIN:
            self.resources[(g, v, plural)] = (kind, namespaced)
        self.objects = {}  # (group, plural, namespace, name) -> object
        self.log = []  # (method, path, content type)
        self.rv = itertools.count(1)
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    def kubeconfig(self, path):
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}))
        path.chmod(0o600)
        return path

    # ------------------------------------------------------------ objects

    def seed(self, obj):
        group, version = self._split(obj["apiVersion"])
        plural = self._plural(group, version, obj["kind"])
        self.create(group, version, plural, obj["metadata"].get("namespace"), obj)

    def get(self, kind, name, namespace=None):
        for (g, plural, ns, n), obj in self.objects.items():
            if obj["kind"] == kind and n == name and ns == namespace:
                return obj
        return None

    def of_kind(self, kind):
        return sorted((o for o in self.objects.values() if o["kind"] == kind),
                      key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"]["name"]))

    @staticmethod
    def _split(api_version):
        return tuple(api_version.split("/")) if "/" in api_version else ("", api_version)

    def _plural(self, group, version, kind):
        for (g, v, plural), (k, _) in self.resources.items():
            if (g, v, k) == (group, version, kind):
                return plural
        raise APIError(404, "NotFound", f"no resource for {group}/{version} {kind}")

    def _stamp(self, obj, old=None):
        meta = obj.setdefault("metadata", {})
        for f in SERVER_FIELDS:
            meta.pop(f, None)
        meta["uid"] = old["metadata"]["uid"] if old else str(uuid.uuid4())
        meta["creationTimestamp"] = old["metadata"]["creationTimestamp"] if old else \
            datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        meta["resourceVersion"] = str(next(self.rv))
        meta["generation"] = (old["metadata"].get("generation", 1) + 1) if old else 1
        if obj["kind"] == "CustomResourceDefinition":
            self._register_crd(obj)
        return obj

    def _register_crd(self, crd):
        spec = crd["spec"]
        for v in spec["versions"]:
            if v.get("served", True):
                self.resources[(spec["group"], v["name"], spec["names"]["plural"])] = (
                    spec["names"]["kind"], spec["scope"] == "Namespaced")
        crd["status"] = {"acceptedNames": spec["names"], "storedVersions": [
            v["name"] for v in spec["versions"] if v.get("storage")],
            "conditions": [{"type": "Established", "status": "True", "reason": "InitialNamesAccepted"},
                           {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts"}]}

    def create(self, group, version, plural, namespace, obj):
        name = obj.get("metadata", {}).get("name")
        if not name:
            raise APIError(422, "Invalid", "metadata.name: Required value")
        key = (group, plural, namespace, name)
        if key in self.objects:
            raise APIError(409, "AlreadyExists", f'{plural} "{name}" already exists')
        obj = copy.deepcopy(obj)
        if namespace:
            obj["metadata"]["namespace"] = namespace
        self.objects[key] = self._stamp(obj)
        return self.objects[key]

    def delete(self, group, plural, namespace, name):
        key = (group, plural, namespace, name)
        if key not in self.objects:
            raise APIError(404, "NotFound", f'{plural} "{name}" not found')
        obj = self.objects.pop(key)
        if obj["kind"] == "CustomResourceDefinition":
            spec = obj["spec"]
            for v in spec["versions"]:
                self.resources.pop((spec["group"], v["name"], spec["names"]["plural"]), None)
            for k in [k for k in self.objects if k[:2] == (spec["group"], spec["names"]["plural"])]:
                del self.objects[k]
        return obj

    # ------------------------------------------------------------ HTTP

    def _discovery(self, path):
        if path == "/version":
            major, minor, _ = self.version.split(".")
            return {"major": major, "minor": minor, "gitVersion": f"v{self.version}",
                    "platform": "linux/amd64"}
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": self.url[7:]}]}
        if path == "/apis":
            groups = {}
            for g, v, _ in self.resources:
                if g:
                    groups.setdefault(g, [])
                    if v not in groups[g]:
                        groups[g].append(v)
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                 "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}}
                for g, vs in sorted(groups.items())]}
        parts = path.strip("/").split("/")
        gv = None
        if parts[0] == "api" and len(parts) == 2:
            gv = ("", parts[1])
        elif parts[0] == "apis" and len(parts) == 3:
            gv = (parts[1], parts[2])
        elif parts[0] == "apis" and len(parts) == 2:
            versions = sorted({v for g, v, _ in self.resources if g == parts[1]})
            if not versions:
                raise APIError(404, "NotFound", path)
            return {"kind": "APIGroup", "apiVersion": "v1", "name": parts[1], "versions": [
                {"groupVersion": f"{parts[1]}/{v}", "version": v} for v in versions]}
        if gv is None:
            return None
        found = [(plural, kind, ns) for (g, v, plural), (kind, ns) in self.resources.items()
                 if (g, v) == gv]
        if not found:
            raise APIError(404, "NotFound", path)
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": "/".join(p for p in gv if p), "resources": [
                    {"name": plural, "singularName": kind.lower(), "namespaced": ns, "kind": kind,
                     "verbs": VERBS} for plural, kind, ns in sorted(found)]}

    def _route(self, path):
        """(group, version, plural, namespace, name) of a resource path."""
        parts = path.strip("/").split("/")
        if parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise APIError(404, "NotFound", path)
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces" and (group, version, rest[2]) in self.resources:
            namespace, rest = rest[1], rest[2:]
        if not rest or (group, version, rest[0]) not in self.resources:
            raise APIError(404, "NotFound", f"the server could not find the requested resource ({path})")
        return group, version, rest[0], namespace, (rest[1] if len(rest) > 1 else None)

    @staticmethod
    def _selected(obj, selector):
        labels = obj.get("metadata", {}).get("labels") or {}
        for term in filter(None, (selector or "").split(",")):
            if "!=" in term:
                k, v = term.split("!=", 1)
                if labels.get(k) == v:
                    return False
            elif "=" in term:
                k, v = term.replace("==", "=").split("=", 1)
                if labels.get(k) != v:
                    return False
            elif labels.get(term) is None:
                return False
        return True

    def handle(self, method, raw_path, content_type, body):
        url = urllib.parse.urlsplit(raw_path)
        query = dict(urllib.parse.parse_qsl(url.query))
        path = url.path
        with self.lock:
            self.log.append((method, path, content_type))
            if method == "GET":
                found = self._discovery(path)
                if found is not None:
                    return 200, found
            if path.startswith("/openapi"):
                raise APIError(404, "NotFound", path)
            group, version, plural, namespace, name = self._route(path)
            kind, _ = self.resources[(group, version, plural)]
            api_version = f"{group}/{version}" if group else version
            key = (group, plural, namespace, name)
            dry_run = "dryRun" in query
            if method == "GET" and name:
                if key not in self.objects:
                    raise APIError(404, "NotFound", f'{plural} "{name}" not found')
                return 200, self.objects[key]
            if method == "GET":
                items = [o for (g, p, ns, _), o in sorted(self.objects.items())
                         if (g, p) == (group, plural) and namespace in (None, ns)
                         and self._selected(o, query.get("labelSelector"))]
                return 200, {"kind": f"{kind}List", "apiVersion": api_version,
                             "metadata": {"resourceVersion": str(next(self.rv))}, "items": items}
            if method == "POST":
                obj = json.loads(body)
                if dry_run:
                    return 201, obj
                return 201, self.create(group, version, plural, namespace, obj)
            if method == "PUT":
                if key not in self.objects:
                    raise APIError(404, "NotFound", f'{plural} "{name}" not found')
                obj = json.loads(body)
                self.objects[key] = self._stamp(obj, self.objects[key])
                return 200, self.objects[key]
            if method == "PATCH":
                current = self.objects.get(key)
                if content_type.startswith("application/apply-patch"):
                    applied = yaml.safe_load(body)
                    if current is None:
                        return 201, applied if dry_run else self.create(
                            group, version, plural, namespace, applied)
                    new = copy.deepcopy(applied)
                    new["metadata"] = {**{k: v for k, v in current["metadata"].items()
                                          if k in SERVER_FIELDS or k == "namespace"},
                                       **applied.get("metadata", {})}
                    if "status" in current and "status" not in applied:
                        new["status"] = current["status"]
                elif current is None:
                    raise APIError(404, "NotFound", f'{plural} "{name}" not found')
                elif content_type.startswith("application/merge-patch"):
                    new = json_merge(current, json.loads(body))
                elif content_type.startswith("application/strategic-merge-patch"):
                    new = strategic_merge(current, json.loads(body))
                else:
                    raise APIError(415, "UnsupportedMediaType", content_type)
                if dry_run:
                    return 200, new
                self.objects[key] = self._stamp(new, current)
                return 200, self.objects[key]
            if method == "DELETE":
                self.delete(group, plural, namespace, name)
                return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success",
                             "details": {"name": name, "kind": plural}}
            raise APIError(405, "MethodNotAllowed", method)

    def _handler(self):
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                content_type = self.headers.get("Content-Type", "")
                if self.command == "DELETE":  # DeleteOptions: nothing this server honours
                    body = ""
                elif content_type.startswith("application/vnd.kubernetes.protobuf"):
                    body, content_type = json.dumps(secret_from_protobuf(raw)), "application/json"
                else:
                    body = raw.decode()
                try:
                    code, payload = server.handle(self.command, self.path, content_type, body)
                except APIError as e:
                    code, payload = e.code, {"kind": "Status", "apiVersion": "v1",
                                             "status": "Failure", "message": e.message,
                                             "reason": e.reason, "code": e.code}
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

        return Handler
