"""weightbridge.Error: every failure of the C++ library, with its code and message."""


class Error(Exception):
    """A WeightBridge failure.

    code: a weightbridge.ErrorCode (INVALID_ARGUMENT, TIMEOUT, ...).
    message: the message of the C++ error (wb::Status::message()), naming the rank, tensor and cause.
    str(error): what C++'s wb::Error::what() gives, "[rank 3] invalid argument: <message>".
    """

    def __init__(self, code, message, text=None):
        super().__init__(message if text is None else text)
        self.code = code
        self.message = message

    def __reduce__(self):
        # Picklable (mpi4py's gather of errors, multiprocessing): the code travels as its integer value.
        return (_rebuild, (int(self.code), self.message, str(self)))


def _rebuild(code, message, text):
    from ._weightbridge import ErrorCode

    return Error(ErrorCode(code), message, text)


Error.__module__ = "weightbridge"
