package fencelock.interop;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.LeaderLatchListener;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.ExponentialBackoffRetry;

/**
 * A Curator client driven line by line on stdin, answering on stdout, for
 * the interoperability tests of fencelock's {@code ?layout=curator}.
 *
 * <p>Arguments: the connect string and the session timeout in
 * milliseconds. Commands: {@code lock NAME PATH} (an InterProcessMutex on
 * PATH, acquired in a thread of its own: a Curator mutex is released by the
 * thread that holds it; answers {@code NAME acquired}), {@code unlock NAME}
 * ({@code NAME released}), {@code latch NAME PATH} (a LeaderLatch, answering
 * {@code NAME leader} / {@code NAME follower} as its leadership changes) and
 * {@code unlatch NAME} ({@code NAME closed}). {@code ready} is printed once
 * connected. A peer that is killed leaves its session to expire.
 */
public final class Peer {
    private static final Map<String, LinkedBlockingQueue<String>> HOLDERS = new ConcurrentHashMap<>();
    private static final Map<String, LeaderLatch> LATCHES = new ConcurrentHashMap<>();

    private Peer() {}

    private static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: Peer CONNECT_STRING SESSION_TIMEOUT_MS");
            System.exit(2);
        }
        CuratorFramework client = CuratorFrameworkFactory.builder()
                .connectString(args[0])
                .sessionTimeoutMs(Integer.parseInt(args[1]))
                .connectionTimeoutMs(5000)
                .retryPolicy(new ExponentialBackoffRetry(100, 10))
                .build();
        client.start();
        if (!client.blockUntilConnected(20, TimeUnit.SECONDS)) {
            System.err.println("could not connect to " + args[0]);
            System.exit(1);
        }
        say("ready");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String line; (line = in.readLine()) != null; ) {
            String[] w = line.trim().split(" ");
            switch (w[0]) {
                case "lock" -> lock(client, w[1], w[2]);
                case "unlock" -> HOLDERS.get(w[1]).put("release");
                case "latch" -> latch(client, w[1], w[2]);
                case "unlatch" -> {
                    LATCHES.remove(w[1]).close();
                    say(w[1] + " closed");
                }
                default -> {
                    System.err.println("unknown command: " + line);
                    System.exit(2);
                }
            }
        }
        client.close();
    }

    private static void lock(CuratorFramework client, String name, String path) {
        LinkedBlockingQueue<String> inbox = new LinkedBlockingQueue<>();
        HOLDERS.put(name, inbox);
        Thread holder = new Thread(() -> {
            try {
                InterProcessMutex mutex = new InterProcessMutex(client, path);
                mutex.acquire();
                say(name + " acquired");
                inbox.take();
                mutex.release();
                say(name + " released");
            } catch (Exception e) {
                e.printStackTrace();
                say(name + " failed " + e);
            }
        });
        holder.setDaemon(true);
        holder.start();
    }

    private static void latch(CuratorFramework client, String name, String path) throws Exception {
        LeaderLatch latch = new LeaderLatch(client, path, name);
        latch.addListener(new LeaderLatchListener() {
            @Override
            public void isLeader() {
                say(name + " leader");
            }

            @Override
            public void notLeader() {
                say(name + " follower");
            }
        });
        LATCHES.put(name, latch);
        latch.start();
    }
}
