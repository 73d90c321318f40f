"""The Kubernetes CEL library functions the chart's ValidatingAdmissionPolicies use, for the
CEL implementation cel-python (PyPI `cel-python`), with the semantics of the API server's
(k8s.io/apiserver/pkg/cel/library, ip.go and cidr.go): addresses and prefixes are parsed like
Go's net/netip (no IPv4 octets with leading zeros, no IPv6 zones, no prefix lengths with
leading zeros), and IPv4-mapped IPv6 addresses are rejected.

Functions: isIP, ip, <ip>.family, isCIDR, cidr, <cidr>.ip, <cidr>.masked, <cidr>.prefixLength,
<cidr>.containsIP, <cidr>.containsCIDR, and string() of IPs and CIDRs. In cel-python a method
call `x.f(a)` is the function `f(x, a)`, so `ip` serves both `ip(string)` and `<cidr>.ip()`.

Also: `evaluate_policy` evaluates one ValidatingAdmissionPolicy (variables, validations and
their messageExpressions) on an object, as the API server does for a request.
"""

import ipaddress
import re

import celpy
from celpy import celtypes

_BITS = re.compile(r"^(0|[1-9][0-9]{0,2})$")


class IP:
    """A CEL `net.IP`."""

    def __init__(self, addr):
        self.addr = addr

    def __eq__(self, other):
        return isinstance(other, IP) and self.addr == other.addr

    def __hash__(self):
        return hash(self.addr)

    def __str__(self):
        return str(self.addr)


class CIDR:
    """A CEL `net.CIDR`: an address (host bits kept, as netip.Prefix) and a prefix length."""

    def __init__(self, addr, bits):
        self.addr, self.bits = addr, bits

    def network(self):
        return ipaddress.ip_network(f"{self.addr}/{self.bits}", strict=False)

    def __eq__(self, other):
        return isinstance(other, CIDR) and (self.addr, self.bits) == (other.addr, other.bits)

    def __hash__(self):
        return hash((self.addr, self.bits))

    def __str__(self):
        return f"{self.addr}/{self.bits}"


def parse_addr(text):
    """netip.ParseAddr, then the library's refusal of IPv4-mapped IPv6; None if invalid."""
    if "%" in text:  # zones
        return None
    try:
        addr = ipaddress.ip_address(text)  # rejects leading zeros in IPv4 octets, like netip
    except ValueError:
        return None
    if addr.version == 6 and addr.ipv4_mapped is not None:
        return None
    return addr


def parse_cidr(text):
    """netip.ParsePrefix, then the library's refusal of IPv4-mapped IPv6; None if invalid."""
    addr_text, slash, bits_text = text.rpartition("/")
    if not slash or not _BITS.match(bits_text):
        return None
    addr = parse_addr(addr_text)
    if addr is None or int(bits_text) > addr.max_prefixlen:
        return None
    return CIDR(addr, int(bits_text))


class CELError(Exception):
    """An evaluation error, as the API server reports one."""


# Functions return parse errors as CEL error values (not exceptions), so that `||`, `&&` and
# `?:` absorb them as CEL specifies: `!isCIDR(x) || cidr(x)...` is true for a bad x.


def _string(value):
    if not isinstance(value, celtypes.StringType):
        raise TypeError(f"no such overload: {type(value).__name__}")
    return str(value)


def is_ip(value):
    return celtypes.BoolType(parse_addr(_string(value)) is not None)


def ip(value):
    if isinstance(value, CIDR):  # <cidr>.ip()
        return IP(value.addr)
    addr = parse_addr(_string(value))
    if addr is None:
        return celpy.CELEvalError(f"IP address parse error during conversion from string: {value}")
    return IP(addr)


def family(value):
    if not isinstance(value, IP):
        raise TypeError("family() applies to an IP")
    return celtypes.IntType(value.addr.version)


def is_cidr(value):
    return celtypes.BoolType(parse_cidr(_string(value)) is not None)


def cidr(value):
    parsed = parse_cidr(_string(value))
    if parsed is None:
        return celpy.CELEvalError(
            f"network address parse error during conversion from string: {value}")
    return parsed


def _cidr_arg(value):
    if not isinstance(value, CIDR):
        raise TypeError("a CIDR method applies to a CIDR")
    return value


def masked(value):
    net = _cidr_arg(value).network()
    return CIDR(net.network_address, net.prefixlen)


def prefix_length(value):
    return celtypes.IntType(_cidr_arg(value).bits)


def contains_ip(value, other):
    other = ip(other) if not isinstance(other, IP) else other
    return celtypes.BoolType(other.addr in _cidr_arg(value).network())


def contains_cidr(value, other):
    other = cidr(other) if not isinstance(other, CIDR) else other
    mine = _cidr_arg(value)
    return celtypes.BoolType(
        mine.bits <= other.bits
        and other.addr.version == mine.addr.version
        and other.network().subnet_of(mine.network()))


def string(value):
    if isinstance(value, (IP, CIDR)):
        return celtypes.StringType(str(value))
    return celtypes.StringType(value)


FUNCTIONS = {
    "isIP": is_ip, "ip": ip, "family": family,
    "isCIDR": is_cidr, "cidr": cidr, "masked": masked, "prefixLength": prefix_length,
    "containsIP": contains_ip, "containsCIDR": contains_cidr,
    "string": string,
}

_ENV = celpy.Environment()


def compile_expr(text):
    """A runnable program for one CEL expression (parse errors raise)."""
    return _ENV.program(_ENV.compile(text), functions=FUNCTIONS)


def _run(program, activation):
    try:
        result = program.evaluate(activation)
    except Exception as e:  # cel-python raises for some errors instead of returning them
        raise CELError(str(e)) from e
    if isinstance(result, celpy.CELEvalError):
        raise CELError(str(result))
    return result


class CompiledPolicy:
    """One ValidatingAdmissionPolicy's spec, compiled."""

    def __init__(self, spec):
        self.variables = [(v["name"], compile_expr(v["expression"]))
                          for v in spec.get("variables", [])]
        self.validations = []
        for v in spec["validations"]:
            message = compile_expr(v["messageExpression"]) if "messageExpression" in v else None
            self.validations.append((v["expression"], compile_expr(v["expression"]),
                                     v.get("message"), message))

    def evaluate(self, obj, old=None):
        """Evaluates every validation on a request for `obj` (an UPDATE from `old` if given).
        Returns [(expression, passed, message)]; an evaluation error raises CELError."""
        activation = {"object": celpy.json_to_cel(obj),
                      "oldObject": celpy.json_to_cel(old),
                      "variables": celtypes.MapType()}
        for name, program in self.variables:
            activation["variables"][celtypes.StringType(name)] = _run(program, activation)
        results = []
        for expression, program, message, message_program in self.validations:
            passed = _run(program, activation)
            if not isinstance(passed, celtypes.BoolType):
                raise CELError(f"{expression}: not a bool but {passed!r}")
            text = message
            if not passed and message_program is not None:
                text = str(_run(message_program, activation))
            results.append((expression, bool(passed), text))
        return results
