"""Shared test configuration: the helper modules tests import get pytest's assert rewriting.

`tests.grpc_fixtures` and `tests.fixtures_s3` hold asserts (and fixtures) used by many test
modules; registering them here, before any test module imports them, gives their failing asserts
pytest's detailed messages and keeps pytest from warning that they could not be rewritten.
"""

import pytest

pytest.register_assert_rewrite("tests.grpc_fixtures", "tests.fixtures_s3")
