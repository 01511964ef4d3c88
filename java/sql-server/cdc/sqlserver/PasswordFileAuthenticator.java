package cdc.sqlserver;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.security.MessageDigest;

import javax.security.sasl.AuthenticationException;

import org.apache.hadoop.conf.Configurable;
import org.apache.hadoop.conf.Configuration;
import org.apache.hive.service.auth.PasswdAuthenticationProvider;

/**
 * The SQL server's password check (hive.server2.authentication=CUSTOM): a client's password must be the
 * content of the server's password file (mode 0600, generated at the first start, named by the system
 * property {@code cdc.sql.server.passwordFile}: Hive makes this class with a HiveConf of its own, which
 * holds system properties but not Spark's conf). The file is read at each login, so a
 * new password takes effect without a restart. The user name is not checked: it names the client in the
 * server's log, nothing more.
 */
public final class PasswordFileAuthenticator implements PasswdAuthenticationProvider, Configurable {

    static final String PASSWORD_FILE_KEY = "cdc.sql.server.passwordFile";
    private Configuration conf;

    @Override
    public void setConf(Configuration conf) {
        this.conf = conf;
    }

    @Override
    public Configuration getConf() {
        return conf;
    }

    @Override
    public void Authenticate(String user, String password) throws AuthenticationException {
        String file = conf == null ? null : conf.get(PASSWORD_FILE_KEY);
        if (file == null || file.isEmpty()) {
            file = System.getProperty(PASSWORD_FILE_KEY);
        }
        if (file == null || file.isEmpty()) {
            throw new AuthenticationException("the SQL server has no password file (" + PASSWORD_FILE_KEY + ")");
        }
        byte[] expected;
        try {
            expected = Files.readAllBytes(Paths.get(file));
        } catch (IOException error) {
            throw new AuthenticationException("the SQL server cannot read its password file", error);
        }
        String stored = new String(expected, StandardCharsets.UTF_8).trim();
        byte[] given = (password == null ? "" : password).getBytes(StandardCharsets.UTF_8);
        if (stored.isEmpty() || !MessageDigest.isEqual(given, stored.getBytes(StandardCharsets.UTF_8))) {
            throw new AuthenticationException("wrong user name or password");
        }
    }
}
