"""Error bodies with an HTTP status: OpenAI's {"error": {"message", "type", "param", "code"}}, and
Anthropic's {"type": "error", "error": {"type", "message"}} on its routes (/v1/messages)."""

from __future__ import annotations

from typing import Any

ERROR_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    401: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
    503: "overloaded_error",
}


class RequestError(Exception):
    """A request the server answers with an error instead of text (never a crash).

    status: HTTP status (400 bad input, 404 unknown route, 503 queue full, 500 a bug).
    param: the request field at fault, when there is one (OpenAI's `param`).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.headers = headers or {}  # e.g. Retry-After with a 503
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, param=self.param, code=self.code)


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """The JSON body OpenAI's API sends with an error status (the openai client reads `message`)."""
    return {
        "error": {
            "message": message,
            "type": ERROR_TYPES.get(status, "invalid_request_error"),
            "param": param,
            "code": code,
        }
    }


def bad_request(message: str, param: str | None = None) -> RequestError:
    return RequestError(400, message, param=param)


# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors); 503 is its overloaded_error
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error_body(
    status: int,
    message: str,
    param: str | None = None,  # noqa: ARG001 - OpenAI's
    code: str | None = None,
) -> dict[str, Any]:  # noqa: ARG001 - fields have no place here
    """The JSON body Anthropic's API sends with an error status (the anthropic client reads it): the
    field at fault is named in the message, which every RequestError of specfill does."""
    kind = ANTHROPIC_ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def is_anthropic_path(path: str) -> bool:
    """Whether a route speaks Anthropic's dialect (its error bodies): /v1/messages and below."""
    return path == "/v1/messages" or path.startswith("/v1/messages/")
