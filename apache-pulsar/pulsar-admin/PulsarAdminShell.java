import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import org.apache.pulsar.admin.cli.PulsarAdminTool;

/**
 * pulsar-admin, one command per line of stdin, in one JVM: a JVM per command costs seconds of
 * CPU. Each line is a command's arguments separated by tabs (the client.conf first, as for
 * PulsarAdminTool's main); PulsarAdminTool.execute runs it as bin/pulsar-admin would, with
 * System.exit off (its test mode), then a line "\0END code" closes its stdout and its stderr.
 */
public final class PulsarAdminShell {
    private static final String END = "\0END ";

    public static void main(String[] ignored) throws Exception {
        Method allowExit = PulsarAdminTool.class.getDeclaredMethod("setAllowSystemExit", boolean.class);
        allowExit.setAccessible(true);
        allowExit.invoke(null, false);
        Method lastExitCode = PulsarAdminTool.class.getDeclaredMethod("getLastExitCode");
        lastExitCode.setAccessible(true);
        BufferedReader commands =
                new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = commands.readLine()) != null) {
            int code;
            try {
                PulsarAdminTool.execute(line.split("\t", -1));
                code = (int) lastExitCode.invoke(null);
            } catch (Throwable error) {
                error.printStackTrace();
                code = 2;
            }
            System.out.println(END + code);
            System.out.flush();
            System.err.println(END + code);
            System.err.flush();
        }
        // the admin client's threads are not daemons: without this the JVM outlives stdin
        System.exit(0);
    }
}
