"""Checks of the API fuzzing run (scripts/api-fuzz.sh, issue 45).

What a request may not do, whatever it sends:
* answer 5xx other than 503 (a 503 is a deliberate answer: an overloaded
  family, a switched-off family, no database);
* answer a 4xx whose body is not a JSON object with an ``error`` field
  naming the problem.
A panic in the broker's log fails the run too (the script looks).
"""

import schemathesis


@schemathesis.check
def no_server_error_but_503(ctx, response, case):
    if response.status_code >= 500 and response.status_code != 503:
        raise AssertionError(f"{case.method} {case.path} answered {response.status_code}: {response.text[:300]}")


@schemathesis.check
def every_refusal_is_json_with_an_error(ctx, response, case):
    if not 400 <= response.status_code < 500:
        return
    try:
        body = response.json()
    except Exception:
        raise AssertionError(f"{case.method} {case.path} answered {response.status_code} without JSON: {response.text[:200]!r}")
    # A per-key read of something absent answers its documented shape.
    if response.status_code == 404 and isinstance(body, dict) and body.get("found") is False:
        return
    if not isinstance(body, dict) or not body.get("error"):
        raise AssertionError(f"{case.method} {case.path} answered {response.status_code} without an error field: {response.text[:200]}")
