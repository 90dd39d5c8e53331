#pragma once
// Whether this process could bind a TCP port: a role checks the ports it will listen on before it joins
// anything, so a port another process holds is named at once, not after a cluster has formed around it.
#include <string>

namespace longwave::runtime {

/// Binds HOST:PORT (SO_REUSEADDR, as ZeroMQ's and httplib's listeners; not listened on) and lets it go.
/// Returns 0 when it could, else the errno (EADDRINUSE: another process holds it; EADDRNOTAVAIL: no
/// interface has that address). A host that does not resolve returns 0: the listener's own bind says why.
/// HOST may be an IPv6 address in brackets.
int bind_error(std::string host, int port);

/// `endpoint` (tcp://HOST:PORT, PORT may be *) as ZeroMQ can bind it: a HOST that is a name (ZeroMQ binds
/// only an address or an interface) becomes its first IPv4 address. Anything else is returned as it is.
std::string bindable_endpoint(const std::string& endpoint);

}  // namespace longwave::runtime
