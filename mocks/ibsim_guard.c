/*
 * Preloaded into ibsim (never into a tool): a client that dies while it attaches must not take
 * the simulator down.
 *
 * A umad2sim client sends SIM_CTL_CONNECT and blocks for the answer; ibsim then connect()s a
 * datagram socket to the client's abstract "<sockname>:in<pid>" name and, if that fails,
 * IBPANICs (sim_ctl_new_client in ibsim.c), which exits the whole simulator. A tool killed on a
 * timeout in that window (the daemon under test rightly kills its tools) has closed the name, so
 * every client of the simulator, opensm included, is lost. A real fabric has no such coupling.
 *
 * Here such a connect() reports success instead: ibsim records the dead client in a slot as if
 * it had attached (nothing is ever sent to it: a client that sends nothing gets no replies), and
 * IbSim.reap_clients frees the slot like that of any other dead client. One line on stderr says
 * so, which ibsim's output reader keeps.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

typedef int (*connect_fn)(int, const struct sockaddr *, socklen_t);

static int is_client_in_socket(const struct sockaddr *addr, socklen_t len)
{
	const struct sockaddr_un *un = (const struct sockaddr_un *)addr;
	size_t off = offsetof(struct sockaddr_un, sun_path);

	if (addr == NULL || addr->sa_family != AF_UNIX || len <= off + 1)
		return 0;
	/* abstract name space: a leading NUL, then "<sockname>:in<pid>" */
	return un->sun_path[0] == '\0' && memmem(un->sun_path + 1, len - off - 1, ":in", 3) != NULL;
}

int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	static connect_fn real;
	int saved;
	int r;

	if (real == NULL)
		real = (connect_fn)dlsym(RTLD_NEXT, "connect");
	if (real == NULL) {
		errno = ENOSYS;
		return -1;
	}
	r = real(fd, addr, len);
	if (r == 0 || !is_client_in_socket(addr, len))
		return r;
	saved = errno;
	if (saved != ECONNREFUSED && saved != ENOENT) {
		errno = saved;
		return r;
	}
	fprintf(stderr, "ibmon-ibsim-guard: a client died while attaching (%s); kept off\n",
		strerror(saved));
	fflush(stderr);
	return 0;
}
