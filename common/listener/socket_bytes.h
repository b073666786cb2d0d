// The bytes a TCP socket has received, from the kernel's TCP_INFO: how the
// listener tells a connection still being sent its first request from an
// idle one (connection_table.h). Its own file: <linux/tcp.h>, which has
// the field, cannot be included beside <netinet/tcp.h>, which has not.
#pragma once

#include <cstdint>

namespace asympo {

// tcpi_bytes_received of the TCP socket `fd`; 0 when `fd` is no TCP socket.
uint64_t SocketBytesReceived(int fd);

}  // namespace asympo
