/* A hostile guest process (run by the agent as uid 1000): tries AF_VSOCK to the host
 * (CID 2) and to the guest agent's own port (1234) on every CID that could reach it, then
 * tries to take the agent's port over. One stderr line per attempt (`WHAT ok` or
 * `WHAT errno-N TEXT`); the exit status is how many succeeded.
 * Built static by the test (`gcc -O1 -static`). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <linux/vm_sockets.h>

static int reached;

static void attempt(const char *what, unsigned cid, unsigned port, int do_listen) {
    int s = socket(AF_VSOCK, SOCK_STREAM, 0);
    if (s < 0) {
        fprintf(stderr, "%s socket-errno-%d %s\n", what, errno, strerror(errno));
        return;
    }
    struct sockaddr_vm a;
    memset(&a, 0, sizeof a);
    a.svm_family = AF_VSOCK;
    a.svm_cid = cid;
    a.svm_port = port;
    int r = do_listen ? bind(s, (struct sockaddr *)&a, sizeof a) : connect(s, (struct sockaddr *)&a, sizeof a);
    if (r == 0 && do_listen)
        r = listen(s, 1);
    if (r == 0) {
        fprintf(stderr, "%s ok\n", what);
        reached++;
    } else {
        fprintf(stderr, "%s errno-%d %s\n", what, errno, strerror(errno));
    }
    close(s);
}

int main(void) {
    fprintf(stderr, "uid %d\n", (int)getuid());
    attempt("host-agent-port", VMADDR_CID_HOST, 1234, 0);
    attempt("host-other-port", VMADDR_CID_HOST, 1024, 0);
    attempt("local-agent-port", VMADDR_CID_LOCAL, 1234, 0);
    attempt("self-agent-port", 3, 1234, 0);
    attempt("bind-agent-port", VMADDR_CID_ANY, 1234, 1);
    printf("reached %d\n", reached);
    return reached;
}
