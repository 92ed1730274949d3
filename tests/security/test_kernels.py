"""Item 3: user kernels belong to their tenant.  Built-ins are immutable; a registered kernel is visible
to its tenant only and released with its client; a cluster can refuse registration altogether (and then
never unpickles the payload)."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from devices.errors import AclError
from devices.kernel import TensorDesc
from devices.tasks import Launch
from devices.tenancy import Owner
from driver.policy import DevicePolicy

from .conftest import SECRET

pytestmark = pytest.mark.security

N = 64


def _evil_relu(ctx, x, y):
    """Bob's 'relu': writes 42 whatever the input."""
    y[0:y.size] = np.full(y.size, 42.0, np.float32)


def _bob_private(ctx, x, y):
    y[0:y.size] = x[0:x.size] * np.float32(2)


def _relu(c, s, x, y, name="relu"):
    c.submit([Launch(s, name, (TensorDesc(x, (N,)),), (TensorDesc(y, (N,)),))])
    c.synchronize_stream(s, 10_000)
    return c.memcpy_d2h(y, 4 * N).view(np.float32)


def _buffers(c):
    x, y = c.malloc(4 * N), c.malloc(4 * N)
    c.memcpy_h2d(x, np.linspace(-1, 1, N, dtype=np.float32))
    return x, y, c.create_stream()


def test_a_builtin_cannot_be_replaced(site):
    srv = site.device()
    alice, bob = site.client(srv, site.tenant("alice")), site.client(srv, site.tenant("bob"))
    with pytest.raises(AclError) as e:
        bob.register_kernel("relu", _evil_relu)
    assert e.value.code == 107000
    x, y, s = _buffers(alice)
    np.testing.assert_array_equal(_relu(alice, s, x, y), np.maximum(np.linspace(-1, 1, N, dtype=np.float32), 0))


def test_a_tenants_kernel_is_invisible_to_others_and_released_with_its_client(site):
    srv = site.device()
    bob_tok = site.tenant("bob")
    alice, bob = site.client(srv, site.tenant("alice")), site.client(srv, bob_tok, client_id="bob-1")
    bob.register_kernel("bob_private_x2", _bob_private)
    x, y, s = _buffers(bob)
    np.testing.assert_allclose(_relu(bob, s, x, y, "bob_private_x2"), 2 * np.linspace(-1, 1, N, dtype=np.float32))
    ax, ay, as_ = _buffers(alice)
    with pytest.raises(AclError) as e:
        _relu(alice, as_, ax, ay, "bob_private_x2")
    assert e.value.code == 507027
    bob2 = site.client(srv, bob_tok, client_id="bob-2")
    np.testing.assert_allclose(_relu(bob2, bob2.create_stream(), x, y, "bob_private_x2"),
                               2 * np.linspace(-1, 1, N, dtype=np.float32))     # shared within the tenant
    bob.close()                                                              # its lease ends: released
    assert srv.leases.wait_released(Owner("bob", "bob-1"), 10.0)
    with pytest.raises(AclError) as e:
        _relu(bob2, bob2.create_stream(), bob2.malloc(4 * N), bob2.malloc(4 * N), "bob_private_x2")
    assert e.value.code == 507027


class _Marker:
    """A payload that creates a file when it is unpickled."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_a_cluster_can_refuse_kernel_registration_before_unpickling(site, tmp_path):
    srv = site.device(policy=DevicePolicy(user_kernels=False))
    marker = tmp_path / "unpickled"
    for token in (site.tenant("bob"), SECRET):
        c = site.client(srv, token)
        with pytest.raises(AclError) as e:
            c.register_kernel_payload("innocent", pickle.dumps(_Marker(marker)))
        assert e.value.code == 207006
        assert not marker.exists()
    open_srv = site.device(23)
    c = site.client(open_srv, site.tenant("bob"))
    with pytest.raises(AclError) as e:                    # a built-in name is refused before unpickling too
        c.register_kernel_payload("relu", pickle.dumps(_Marker(marker)))
    assert e.value.code == 107000 and not marker.exists()
