"""The exception every failed sfmoe C API call raises (the native extension creates it)."""


class Error(RuntimeError):
    """A failure reported by the sfmoe C library.

    ``str(error)`` is the library's own message (``sfmoe_last_error()``), unchanged;
    ``error.status`` is the status name (e.g. ``"SFMOE_ERROR_MISALIGNED"``) and ``error.code``
    its integer value.
    """

    def __init__(self, message, status="SFMOE_ERROR_INTERNAL", code=None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code

    def __reduce__(self):
        return (type(self), (self.message, self.status, self.code))

    def __repr__(self):
        return f"sfmoe.Error({self.status}: {self.message!r})"
