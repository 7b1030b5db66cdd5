// The notebooks of notebook jobs (portal/session/job/launcher.py: job_notebook), opened in JupyterLab as
// read-only documents of a drive of their own, "JobFiles:<job id>/<output.ipynb>": the jobs' folder
// (~/.dsportal/jobs) stays hidden to the file browser and the contents API.
import { Contents, ServerConnection } from '@jupyterlab/services';

import { api, sessionUrl } from './api';

export const DRIVE = 'JobFiles';

const READ_ONLY =
  "A job's notebook is kept as the job left it. To edit it, File > Download it and upload it to a folder of yours.";

/** A do-nothing signal: a job's notebooks change only while it runs, and are read afresh when opened. */
const quiet = { connect: () => true, disconnect: () => true, block: () => undefined } as any;

export class JobFilesDrive implements Contents.IDrive {
  readonly name = DRIVE;
  readonly serverSettings = ServerConnection.makeSettings();
  readonly fileChanged = quiet;
  isDisposed = false;

  dispose(): void {
    this.isDisposed = true;
  }

  async get(localPath: string): Promise<Contents.IModel> {
    const [jobId, name] = localPath.split('/');
    return api<Contents.IModel>('GET', `jobs/${encodeURIComponent(jobId)}/files/${encodeURIComponent(name ?? '')}`);
  }

  async getDownloadUrl(localPath: string): Promise<string> {
    const [jobId, name] = localPath.split('/');
    return sessionUrl('dsportal/api/jobs', jobId, 'files', name ?? '') + '?download=1';
  }

  async listCheckpoints(): Promise<Contents.ICheckpointModel[]> {
    return [];
  }

  newUntitled(): Promise<Contents.IModel> {
    return Promise.reject(new Error(READ_ONLY));
  }

  delete(): Promise<void> {
    return Promise.reject(new Error(READ_ONLY));
  }

  rename(): Promise<Contents.IModel> {
    return Promise.reject(new Error(READ_ONLY));
  }

  save(): Promise<Contents.IModel> {
    return Promise.reject(new Error(READ_ONLY));
  }

  copy(): Promise<Contents.IModel> {
    return Promise.reject(new Error(READ_ONLY));
  }

  createCheckpoint(): Promise<Contents.ICheckpointModel> {
    return Promise.reject(new Error(READ_ONLY));
  }

  restoreCheckpoint(): Promise<void> {
    return Promise.reject(new Error(READ_ONLY));
  }

  deleteCheckpoint(): Promise<void> {
    return Promise.reject(new Error(READ_ONLY));
  }
}
