// The session server's dsportal API (portal/session/job/api.py), through JupyterLab's own connection
// settings: base URL, XSRF header and token are those of the page.
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

const settings = ServerConnection.makeSettings();

export function sessionUrl(...parts: string[]): string {
  return URLExt.join(settings.baseUrl, ...parts);
}

/** A JSON call; a refusal throws an Error whose message is the server's reason, for a person. */
export async function api<T = any>(method: string, path: string, body?: unknown): Promise<T> {
  const init: RequestInit = { method, headers: { 'Content-Type': 'application/json' } };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
  }
  const response = await ServerConnection.makeRequest(sessionUrl('dsportal/api', path), init, settings);
  let data: any = {};
  try {
    data = await response.json();
  } catch {
    data = {};
  }
  if (!response.ok) {
    throw new Error(data.message || response.statusText || `HTTP ${response.status}`);
  }
  return data as T;
}

/** The websocket of one job's log: the log so far, each rank's new lines, then its final state. */
export function streamUrl(jobId: number): string {
  const url = URLExt.join(settings.wsUrl, 'dsportal/api/jobs', String(jobId), 'stream');
  return settings.token ? `${url}?token=${encodeURIComponent(settings.token)}` : url;
}

/** 42 -> '42 s', 300 -> '5 min', 7500 -> '2 h 05 min' (as portal.core.settings.human_duration). */
export function duration(seconds: number): string {
  seconds = Math.max(0, Math.floor(seconds));
  if (seconds < 60) {
    return `${seconds} s`;
  }
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) {
    return `${minutes} min`;
  }
  const rest = minutes % 60;
  return `${Math.floor(minutes / 60)} h` + (rest ? ` ${String(rest).padStart(2, '0')} min` : '');
}

// What tests and curious users can read in the page (window.dsportalLab).
export const state: { [key: string]: unknown } = {};
(window as any).dsportalLab = state;
