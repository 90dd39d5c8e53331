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

}  // namespace longwave::runtime
